"""The sandbox image: built offline (:mod:`.build`) from what :mod:`.layout` says an image holds, and verified
(:mod:`.verify`) against it before anything runs on it."""

from code_sandbox.image.build import build_offline_image
from code_sandbox.image.layout import FILES_LABEL, RUNTIME_DIGEST_LABEL, RUNTIME_MODE
from code_sandbox.image.verify import Check, VerifiedImages, VerifyReport, verification_key, verify_image

__all__ = [
    "FILES_LABEL",
    "RUNTIME_DIGEST_LABEL",
    "RUNTIME_MODE",
    "Check",
    "VerifiedImages",
    "VerifyReport",
    "build_offline_image",
    "verification_key",
    "verify_image",
]
