"""attnlab.book owns the chapters' thread count (`book.ChapterThreads`): one torch thread for their small views, torch's
default count back inside the heavy computations (figure Results, traces, cached experiments). Each test makes its own
ChapterThreads: no module state to reset."""
import torch

from attnlab import book
from attnlab.core import util


def _reset(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    old = torch.get_num_threads()
    torch.set_num_threads(util.THREADS.default)
    return old


def test_views_one_thread_heavy_default(monkeypatch):
    old = _reset(monkeypatch)
    chapter = book.ChapterThreads()
    try:
        chapter.for_views()
        assert torch.get_num_threads() == 1 and chapter.one
        with chapter.heavy():
            assert torch.get_num_threads() == util.THREADS.default
            assert not util.threads_chosen()          # so auto_threads may still lower it to the free CPUs
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(old)


def test_user_choice_kept(monkeypatch):
    old = _reset(monkeypatch)
    chapter = book.ChapterThreads()
    try:
        monkeypatch.setenv("OMP_NUM_THREADS", "2")
        chapter.for_views()
        assert torch.get_num_threads() == util.THREADS.default and not chapter.one
        with chapter.heavy():
            assert torch.get_num_threads() == util.THREADS.default
    finally:
        torch.set_num_threads(old)


def test_a_fresh_thread_state_counts_its_own_contexts(monkeypatch):
    """`util.ThreadState` is an object: a new one starts from torch's count now, with no context open, and its
    `threads(n)` nests and restores as the process's does."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    state = util.ThreadState()
    old = torch.get_num_threads()
    assert state.depth == state.auto == 0 and state.default == old and not state.threads_chosen()
    with state.threads(1):
        assert torch.get_num_threads() == 1 and state.depth == 1 and state.threads_chosen()
        assert util.THREADS.depth == 0                  # the process's bookkeeping is another object
    assert torch.get_num_threads() == old and state.depth == 0
