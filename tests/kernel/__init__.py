"""The monitor's pure core: diagnosis rules, the alert book, the wire and the record spec,
on synthetic records (no training).
"""
