"""The cores' cycle models, one per stage kind, in one list: :data:`CORE_KINDS` and
:func:`core_kind`. A new core kind is a :class:`~onnx2fpga.plan.stage.CoreKind` subclass
beside its other figures (``plan/<core>.py``) and one entry here.
"""

from __future__ import annotations

from .cmvm import CmvmTiming
from .depthwise import DepthwiseTiming
from .joins import AddTiming, ForkTiming
from .lut import LutTiming
from .matvec import MatVecTiming
from .plumbing import CastTiming, ConvertTiming, FifoTiming
from .reduce import ReduceTiming
from .requant import RequantTiming
from .resize import ReorderTiming, ResizeTiming
from .slice import SliceTiming
from .stage import CoreKind, Stage
from .thresholds import ThresholdTiming
from .window import WindowTiming

__all__ = ["CORE_KINDS", "core_kind"]

#: Stage kind -> its cycle model.
CORE_KINDS: dict[str, CoreKind] = {
    kind: model for model in (
        MatVecTiming(), RequantTiming(), ThresholdTiming(), FifoTiming(), ConvertTiming(),
        CastTiming(), WindowTiming(), ReduceTiming(), DepthwiseTiming(), ForkTiming(),
        AddTiming(), ResizeTiming(), ReorderTiming(), LutTiming(), SliceTiming(),
        CmvmTiming())
    for kind in model.kinds}


def core_kind(stage: Stage) -> CoreKind:
    """The cycle model of ``stage``'s kind, or ``ValueError`` for an unknown kind."""
    try:
        return CORE_KINDS[stage.kind]
    except KeyError:
        raise ValueError(f"Unknown stage kind {stage.kind!r}") from None
