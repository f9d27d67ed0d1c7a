"""Repeated captures in one process keep a flat memory: no tensor, hook or record is left behind by a capture, a
swapped-normalizer pass or a native pass for layer outputs (issue 37, item 4; on a tiny model)."""
import gc

import torch

from attnlab.core.capture import KEEPABLE
from attnlab.core.models import load_model

N_CAPTURES = 5


def live() -> dict:
    """What the process holds after a garbage collection: live tensors, and the bytes of their distinct storages."""
    gc.collect()
    tensors = [o for o in gc.get_objects() if issubclass(type(o), torch.Tensor)]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return {"tensors": len(tensors), "bytes": sum(storages.values())}


def held(model) -> dict:
    """What the model's capture machinery holds: hooks on its modules and the CaptureState's containers."""
    st = model.state
    return {"hooks": sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.hf.modules()),
            "calls": len(st.calls), "records": len(st.records), "buffers": len(st.buffers),
            "normalizers": len(st.normalizers)}


def test_repeated_captures_keep_a_flat_memory():
    model = load_model("tiny-gpt2")
    ids = torch.arange(64)
    seen = []
    for _ in range(N_CAPTURES):
        trace = model.capture(ids, keep=KEEPABLE)
        with model.normalizer(lambda s, visible: torch.softmax(s.masked_fill(~visible, float("-inf")), -1)):
            model.forward(ids)
        outputs = model.layer_outputs(ids)
        del trace, outputs
        seen.append({**live(), **held(model)})
    assert all(s == seen[1] for s in seen[1:]), seen      # (the first round may fill caches once)
    assert seen[-1]["records"] == seen[-1]["buffers"] == seen[-1]["normalizers"] == 0
