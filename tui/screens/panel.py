"""The common frame of the monitor's modal views: a bordered, scrolling panel."""

from __future__ import annotations

from textual.screen import ModalScreen


class PanelScreen(ModalScreen[None]):
    """A centred panel over the monitor; subclasses fill a ``VerticalScroll`` and may
    change its size or border colour in their own ``DEFAULT_CSS``."""

    DEFAULT_CSS = """
    PanelScreen {
        align: center middle;
    }
    PanelScreen > VerticalScroll {
        width: 90%;
        max-width: 110;
        height: auto;
        max-height: 90%;
        border: thick $accent;
        background: $surface;
        padding: 1 2;
    }
    PanelScreen Static {
        margin-bottom: 1;
    }
    """
