"""Across processes: the command line, traintop run, torchrun jobs, the terminal in tmux,
the benches' own checks.
"""
