"""The error every reader of a data file raises."""


class DataError(ValueError):
    """A data file is malformed; the message names the file, the item and the field."""
