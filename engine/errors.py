"""Named errors. Each message names the file, key or value at fault and the setting to change."""

import reprlib


class SnugError(Exception):
    """Base of every error the engine raises on purpose."""


class ConfigError(SnugError):
    """config.json is missing, unreadable, of an unknown model type or an impossible shape."""


class CheckpointError(SnugError):
    """Weights are missing, truncated, of the wrong shape or in an unsupported format."""


class TokenizerError(SnugError):
    """tokenizer.json or the chat template is missing or unusable."""


class TemplateError(TokenizerError):
    """The chat template failed to render or tried to reach outside its sandbox."""


class SettingOutOfRange(SnugError, ValueError):
    """A request's setting (a sampling knob, max_new_tokens) is out of its range; the message
    names the setting and its value."""


class BackendUnavailable(SnugError):
    """The requested backend cannot run here (for example: no NVIDIA GPU for `cuda`)."""


class UnsupportedModel(BackendUnavailable):
    """The CUDA kernels do not cover this model's shape (a config key's value) or this GPU;
    the numpy backend runs it. Raised at load, before anything is allocated."""


class RequestRefused(SnugError):
    """One request cannot be served; the engine and every other stream stay intact."""


class ScratchGrowFailed(RequestRefused):
    """The forward scratch could not grow to the rows a request needs; the old scratch is kept."""


class WorkspaceGrowFailed(RequestRefused):
    """The prompt-projection workspace could not grow; the old workspace is kept."""


class GraphCaptureFailed(RequestRefused):
    """A decode step's CUDA graph could not be captured for lack of memory; the graphs
    already captured and every stream's state are kept, and the next step tries again."""


class DeviceOutOfMemory(SnugError):
    """A device allocation failed outside the growth paths (load, stream state, prompt cache)."""


class DoesNotFit(SnugError):
    """Admission found no arrangement that fits; `decision` holds the breakdown and the
    suggestions (shorter context, fewer streams, 4-bit format, lower reserve)."""

    def __init__(self, message: str, decision: object = None) -> None:
        super().__init__(message)
        self.decision = decision


class NumericalError(RequestRefused):
    """The model produced NaN or infinite logits: the weights or the compute dtype are at fault,
    and sampling from them would print garbage (or token 0) without a word."""


class TemplateLimitError(TemplateError):
    """The chat template ran past its time, size or nesting budget (engine.template_sandbox)."""


_QUOTE = reprlib.Repr()
_QUOTE.maxlevel, _QUOTE.maxdict, _QUOTE.maxlist, _QUOTE.maxtuple = 3, 6, 8, 8
_QUOTE.maxstring, _QUOTE.maxother, _QUOTE.maxlong = 160, 160, 40


def quoted(value: object, limit: int = 200) -> str:
    """`repr(value)` cut to at most `limit` characters, for messages that quote a value read
    from a downloaded file: a 100 MB header entry must not become a 100 MB message."""
    if isinstance(value, int) and value.bit_length() > 256:
        return f"<an integer of {value.bit_length()} bits>"  # repr of a huge int is slow
    try:
        text = _QUOTE.repr(value)
    except (ValueError, RecursionError, MemoryError):
        text = f"<a {type(value).__name__} that cannot be shown>"
    return text if len(text) <= limit else text[: limit - 3] + "..."
