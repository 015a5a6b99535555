"""The monitor's screens and its headless mode, driven by frames (Textual's pilot, snapshots)."""
