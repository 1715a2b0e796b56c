"""Named errors. Each message names the file, key or value at fault and the setting to change."""


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


class BackendUnavailable(SnugError):
    """The requested backend cannot run here (for example: no NVIDIA GPU for `cuda`)."""


class RequestRefused(SnugError):
    """One request cannot be served; the engine and every other stream stay intact."""


class ScratchGrowFailed(RequestRefused):
    """The forward scratch could not grow to the rows a request needs; the old scratch is kept."""


class WorkspaceGrowFailed(RequestRefused):
    """The prompt-projection workspace could not grow; the old workspace is kept."""


class DeviceOutOfMemory(SnugError):
    """A device allocation failed outside the growth paths (load, stream state, prompt cache)."""


class DoesNotFit(SnugError):
    """Admission found no arrangement that fits; `decision` holds the breakdown and the
    suggestions (shorter context, fewer streams, 4-bit format, lower reserve)."""

    def __init__(self, message: str, decision: object = None) -> None:
        super().__init__(message)
        self.decision = decision
