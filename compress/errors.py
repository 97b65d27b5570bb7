"""The one exception type users see: a problem whose cause is known, with its fix in the text."""


class LlmpressError(Exception):
    """Bad input or environment. The CLI prints it as one line and exits with status 2."""
