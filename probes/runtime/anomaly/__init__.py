"""Non-finite values: kept from the weights (the guard), and traced to their producer."""
