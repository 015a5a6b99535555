"""The repository itself: the docs and their links, the module sizes, the import graph, the
install.
"""
