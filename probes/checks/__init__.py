"""The pre-training checks of rungs 1 to 3.

Data and splits (rung 1), one batch's shapes, values and loss contract (rung 2), and the
tiny-batch test (rung 3): run by a person before or beside training, torch only.
"""
