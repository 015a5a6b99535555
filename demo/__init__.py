"""traintop's bundled trainer: each failure mode of the lesson on synthetic data.

``python -m demo SCENARIO`` runs one against whatever monitor listens;
``traintop demo SCENARIO`` starts it with a monitor attached.
"""
