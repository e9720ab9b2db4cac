"""Stored Trajectory records -> padded training tensors, grouped for shared-prompt training.

Training uses each trajectory's stored `token_ids` exactly as sampled (never a re-tokenized
transcript) and its `loss_mask` as the set of tokens that carry loss. Token i is scored by the
model's logits at position i - 1, so a mask-1 token at position 0 is an error.

A group (same `group_id`) whose samples all start with the same `prompt_len` tokens can be
trained with that prompt computed once (see coevo/rl/trainer.py); the part after the first
prompt may differ between samples (multi-turn episodes), it is all "continuation".

Layout of a micro-batch: a window of W scored columns; column c is episode position
`start + c` of every row. Shared path: rows are the continuations `ids[P:]` and start = P.
Plain path: rows are whole sequences and start = the first scored position of any row.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch

from coevo.errors import CoevoError
from coevo.rl.estimators import AdvantageEstimator, make_estimator, token_advantages
from coevo.rl.grpo import Scale
from coevo.rl.processing import TokenProcessing, WindowProcessing, window_processing
from coevo.trajectory import Trajectory

PAD_ID = 0  # any valid id: padded positions are masked and, right-padded, never attended to


class TrajectoryError(CoevoError):
    """A trajectory cannot be trained on; the message names its id and the field at fault."""

    def __init__(self, traj_id: str, field: str, reason: str):
        self.traj_id, self.field = traj_id, field
        super().__init__(f"trajectory {traj_id}: {field}: {reason}")


@dataclass
class Sample:
    """One trajectory ready to train; all tensors are indexed by episode position."""

    traj_id: str
    group: str
    ids: torch.Tensor  # [n] int64
    mask: torch.Tensor  # [n] float32, 1 on policy tokens
    old_logp: torch.Tensor  # [n] float32, 0 where mask is 0
    advantage: float  # the episode's advantage
    reward: float
    prompt_len: int
    ref_logp: torch.Tensor | None = None  # [n], filled by the trainer when kl_coef > 0
    # How each policy token was drawn (None: raw, unconstrained); see coevo/rl/processing.py.
    processing: TokenProcessing | None = None
    # [n] per-position advantages when the estimator credits turns (None: `advantage` everywhere)
    token_adv: torch.Tensor | None = None
    # False: its group carries no reward signal and it is trained by the teacher term alone
    # (coevo/rl/teacher.py); the GRPO term leaves it out.
    signal: bool = True
    teacher_logp: torch.Tensor | None = None  # [n] under the teacher's context, when it has one

    @property
    def adv_tokens(self) -> torch.Tensor:
        """[n] the advantage of every position."""
        return self.token_adv if self.token_adv is not None else torch.full((self.n,), self.advantage)

    @property
    def n(self) -> int:
        return int(self.ids.numel())

    @property
    def tokens(self) -> int:
        return int(self.mask.sum())

    @property
    def first_scored(self) -> int:
        return int(torch.nonzero(self.mask)[0]) if self.tokens else self.n


@dataclass
class Group:
    id: str
    samples: list[Sample]
    shared_len: int  # tokens every sample starts with (the first prompt); 0 = nothing shared


@dataclass
class Plan:
    """What one batch of trajectories turns into, with the counts reported in StepStats."""

    groups: list[Group]  # only groups that carry a learning signal
    n_trajectories: int
    n_groups: int
    signal_fraction: float
    reward_mean: float  # over included (not excluded) trajectories
    excluded: int  # infrastructure failures / unrewarded: missing data, not zero reward
    skipped: int  # trajectories in groups without signal (or, for SFT, unsuccessful)

    @property
    def samples(self) -> list[Sample]:
        return [s for g in self.groups for s in g.samples]


def to_sample(traj: Trajectory, advantage: float, need_logprobs: bool = True,
              processed: bool = True, token_adv: torch.Tensor | None = None) -> Sample:
    """Validate one trajectory for training and convert it to tensors; `processed` keeps how
    its tokens were sampled (GRPO), False scores them raw (SFT)."""
    tid = traj.id
    if traj.split == "imported":  # coevo.traces.IMPORTED: evidence for proposers only
        raise TrajectoryError(tid, "split", "is 'imported': an imported trace is never trained on")
    if not traj.trainable:
        raise TrajectoryError(tid, "trainable", "is False (the backend returned no token ids "
                              "or log-probs); train only on trajectories from a trainable backend")
    n = len(traj.token_ids)
    if n == 0:
        raise TrajectoryError(tid, "token_ids", "is empty")
    if len(traj.loss_mask) != n:
        raise TrajectoryError(tid, "loss_mask", f"has {len(traj.loss_mask)} entries for {n} tokens")
    if any(m not in (0, 1) for m in traj.loss_mask):
        raise TrajectoryError(tid, "loss_mask", "must hold only 0 and 1")
    if traj.loss_mask[0]:
        raise TrajectoryError(tid, "loss_mask", "is 1 at position 0 (nothing precedes it)")
    if need_logprobs and len(traj.logprobs) != n:
        raise TrajectoryError(tid, "logprobs", f"has {len(traj.logprobs)} entries for {n} tokens "
                              "(needed as the old policy unless old log-probs are recomputed)")
    if not 0 <= traj.prompt_len <= n:
        raise TrajectoryError(tid, "prompt_len", f"{traj.prompt_len} is outside 0..{n}")
    if any(traj.loss_mask[: traj.prompt_len]):
        raise TrajectoryError(tid, "loss_mask", "is 1 inside the first prompt (prompt_len)")
    mask = torch.tensor(traj.loss_mask, dtype=torch.float32)
    old = torch.tensor(traj.logprobs, dtype=torch.float32) if traj.logprobs else torch.zeros(n)
    return Sample(
        traj_id=tid, group=traj.group_id or tid, ids=torch.tensor(traj.token_ids, dtype=torch.long),
        mask=mask, old_logp=old * mask, advantage=float(advantage),
        reward=float(traj.reward if traj.reward is not None else 0.0), prompt_len=traj.prompt_len,
        processing=TokenProcessing.of(traj) if processed else None, token_adv=token_adv,
    )


def shared_prefix_len(samples: Sequence[Sample]) -> int:
    """The first-prompt length all samples share exactly (0 when they do not)."""
    p = samples[0].prompt_len
    if p <= 0 or any(s.prompt_len != p or s.n <= p for s in samples):
        return 0
    head = samples[0].ids[:p]
    return p if all(torch.equal(s.ids[:p], head) for s in samples[1:]) else 0


def _by_group(trajs: Iterable[Trajectory]) -> "OrderedDict[str, list[Trajectory]]":
    out: OrderedDict[str, list[Trajectory]] = OrderedDict()
    for t in trajs:
        out.setdefault(t.group_id or t.id, []).append(t)
    return out


def _excluded(t: Trajectory) -> bool:
    return t.infra_failed or t.reward is None


def _make_group(gid: str, samples: list[Sample]) -> Group | None:
    # Samples without policy tokens contribute nothing (they still counted in the group mean).
    live = [s for s in samples if s.tokens > 0]
    return Group(gid, live, shared_prefix_len(live)) if live else None


def plan_grpo(trajs: Sequence[Trajectory], scale: Scale = "std", eps: float = 1e-6,
              need_logprobs: bool = True, estimator: AdvantageEstimator | None = None,
              keep_all: bool = False) -> Plan:
    """Group trajectories, drop infra failures, credit them (`estimator`, default `grpo`
    with `scale` / `eps`), keep the groups with any nonzero credit (learning signal).
    `keep_all` also keeps the groups without signal, after them, their samples marked
    `signal=False` (a teacher term trains on them; the counts are unchanged)."""
    groups = _by_group(trajs)
    excluded = 0
    kept: OrderedDict[str, list[Trajectory]] = OrderedDict()
    for gid, members in groups.items():
        ok = [t for t in members if not _excluded(t)]
        excluded += len(members) - len(ok)
        if ok:
            kept[gid] = ok
    est = estimator or make_estimator("grpo", scale=scale, eps=eps)
    credits = est.credit(kept)
    signal = [gid for gid in kept if any(c.nonzero for c in credits[gid])]
    out: list[Group] = []
    quiet = [gid for gid in kept if gid not in set(signal)] if keep_all else []
    for gid in [*signal, *quiet]:
        g = _make_group(gid, [to_sample(t, c.episode, need_logprobs,
                                        token_adv=token_advantages(t, c))
                              for t, c in zip(kept[gid], credits[gid])])
        if g is not None:
            for smp in g.samples:
                smp.signal = gid not in quiet
            out.append(g)
    all_r = [float(t.reward) for ms in kept.values() for t in ms]
    return Plan(
        groups=out, n_trajectories=len(trajs), n_groups=len(kept),
        signal_fraction=len(signal) / len(kept) if kept else 0.0,
        reward_mean=sum(all_r) / len(all_r) if all_r else 0.0, excluded=excluded,
        skipped=sum(len(kept[g]) for g in kept if g not in set(signal)),
    )


def plan_sft(trajs: Sequence[Trajectory]) -> Plan:
    """Rejection-sampling warm-up: the successful trajectories, each token weighted 1."""
    excluded = sum(1 for t in trajs if t.infra_failed)
    ok = [t for t in trajs if not t.infra_failed]
    good = [t for t in ok if t.success]
    out = []
    for gid, members in _by_group(good).items():
        g = _make_group(gid, [to_sample(t, 1.0, need_logprobs=False, processed=False)
                              for t in members])
        if g is not None:
            out.append(g)
    rs = [float(t.reward) for t in ok if t.reward is not None]
    return Plan(groups=out, n_trajectories=len(trajs), n_groups=len(_by_group(ok)),
                signal_fraction=len(good) / len(ok) if ok else 0.0,
                reward_mean=sum(rs) / len(rs) if rs else 0.0, excluded=excluded,
                skipped=len(ok) - len(good))


@dataclass
class MicroBatch:
    samples: list[Sample]
    prompt_ids: torch.Tensor | None  # [P] shared prompt (shared path) or None (plain path)
    input_ids: torch.Tensor  # [B, T] right-padded continuations (shared) or sequences (plain)
    start: int  # episode position of window column 0
    targets: torch.Tensor  # [B, W] token scored at each window column
    mask: torch.Tensor  # [B, W]
    old_logp: torch.Tensor  # [B, W]
    ref_logp: torch.Tensor | None  # [B, W]
    advantages: torch.Tensor  # [B], or [B, W] per token when an estimator credits turns
    cost: int = field(default=0)  # tokens through the model (shared prompt counted once)
    processing: WindowProcessing | None = None  # how the scored tokens were sampled
    teacher_logp: torch.Tensor | None = None  # [B, W] under the teacher's context
    signal: torch.Tensor | None = None  # [B] 1.0 where the GRPO term applies (None: every row)

    @property
    def width(self) -> int:
        return int(self.targets.shape[1])

    def to(self, device: torch.device | str) -> "MicroBatch":
        move = lambda t: t.to(device) if t is not None else None  # noqa: E731
        return MicroBatch(self.samples, move(self.prompt_ids), move(self.input_ids), self.start,
                          move(self.targets), move(self.mask), move(self.old_logp),
                          move(self.ref_logp), move(self.advantages), self.cost,
                          self.processing, move(self.teacher_logp), move(self.signal))


def _window(samples: Sequence[Sample], start: int, width: int, attr: str) -> torch.Tensor:
    out = torch.zeros(len(samples), width, dtype=torch.long if attr == "ids" else torch.float32)
    for b, s in enumerate(samples):
        seg = getattr(s, attr)[start: start + width]
        out[b, : seg.numel()] = seg
    return out


def make_microbatch(samples: Sequence[Sample], shared_len: int = 0) -> MicroBatch:
    """Pad `samples` into one micro-batch; shared_len > 0 selects the shared-prompt layout."""
    samples = list(samples)
    with_ref = all(s.ref_logp is not None for s in samples)
    with_teacher = all(s.teacher_logp is not None for s in samples)
    if shared_len:
        start = shared_len
        width = max(s.n for s in samples) - start
        prompt = samples[0].ids[:shared_len]
        input_ids = _window(samples, start, width, "ids")  # [B, W] continuations
        targets = input_ids
    else:
        start = max(1, min(s.first_scored for s in samples))
        full = max(s.n for s in samples)
        width = full - start
        prompt = None
        input_ids = _window(samples, 0, full, "ids")  # [B, T] whole sequences
        targets = input_ids[:, start:]
    mask = _window(samples, start, width, "mask")
    if any(s.token_adv is not None for s in samples):
        advantages = _window(samples, start, width, "adv_tokens")  # [B, W]
    else:
        advantages = torch.tensor([s.advantage for s in samples], dtype=torch.float32)  # [B]
    return MicroBatch(
        samples=samples, prompt_ids=prompt, input_ids=input_ids, start=start, targets=targets,
        mask=mask, processing=window_processing(samples, start, width, mask),
        old_logp=_window(samples, start, width, "old_logp"),
        ref_logp=_window(samples, start, width, "ref_logp") if with_ref else None,
        advantages=advantages, cost=microbatch_cost(samples, shared_len),
        teacher_logp=_window(samples, start, width, "teacher_logp") if with_teacher else None,
        signal=None if all(s.signal for s in samples) else torch.tensor(
            [float(s.signal) for s in samples]),
    )


def microbatch_cost(samples: Sequence[Sample], shared_len: int = 0) -> int:
    """Tokens through the model: the shared prompt once plus padded continuations, or the
    padded whole sequences."""
    longest = max(s.n for s in samples)
    return shared_len + len(samples) * (longest - shared_len)


def _pack(samples: Sequence[Sample], cost_of, max_tokens: int) -> list[list[Sample]]:
    # Greedy in input order (reproducible); a sample alone over the cap still gets its own chunk.
    chunks: list[list[Sample]] = []
    cur: list[Sample] = []
    for s in samples:
        if cur and cost_of(cur + [s]) > max_tokens:
            chunks.append(cur)
            cur = []
        cur.append(s)
    if cur:
        chunks.append(cur)
    return chunks


def microbatches(groups: Sequence[Group], max_tokens: int, shared: bool = True) -> list[MicroBatch]:
    """Split groups into micro-batches of at most `max_tokens` model tokens each.

    With `shared`, a group with a common prompt is split into chunks of its own samples (each
    chunk runs the prompt once); every other sample is packed with the plain layout.
    """
    out: list[MicroBatch] = []
    plain: list[Sample] = []
    for g in groups:
        if shared and g.shared_len:
            cost = lambda ss, p=g.shared_len: microbatch_cost(ss, p)  # noqa: E731
            out += [make_microbatch(c, g.shared_len) for c in _pack(g.samples, cost, max_tokens)]
        else:
            plain += g.samples
    out += [make_microbatch(c) for c in _pack(plain, microbatch_cost, max_tokens)]
    return out
