"""The library's exception types; the CLI turns each into one line and exit code 2."""


class LmperfError(Exception):
    """Base class for errors that describe bad input or a bad environment, not a bug."""


class SpecError(LmperfError, ValueError):
    """A run specification (size, precision, mode, ...) is invalid."""


class ModelLoadError(LmperfError):
    """A user's `--model package.module:factory` cannot be imported or returns the wrong thing."""


class ResultsFileError(LmperfError):
    """A results file cannot be written, or holds a line that is not a valid record."""


class TraceFormatError(LmperfError, ValueError):
    """A trace file cannot be read or is not a Chrome trace with `traceEvents`."""


class SnapshotFormatError(LmperfError, ValueError):
    """A file is missing, is not a pickle, or is not a CUDA memory snapshot."""
