"""Every TRL import lives here: TRL moves helpers between releases, so this is the one file to fix.

Only positional arguments are used for `selective_log_softmax` (keyword arguments arrived in TRL 1.14).
"""

from trl.trainer.utils import disable_dropout_in_model, entropy_from_logits, selective_log_softmax

__all__ = ["disable_dropout_in_model", "entropy_from_logits", "selective_log_softmax"]
