"""Batched token sampling with per-request temperature, top-p and random generator.

The returned logprob of a sampled token is taken from the distribution it was actually drawn from:
log_softmax(logits / temperature), restricted to the top-p nucleus and renormalized over it. For greedy rows
(temperature 0) the distribution is a point mass, which tells a trainer nothing, so their logprob is the
model's plain log_softmax(logits) (temperature 1, no top-p) — the same convention vLLM uses for greedy.

Each row draws its random number from its own `torch.Generator`, so a seeded request samples the same tokens
whatever else is in the batch (up to float noise in the logits themselves).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class RowSampling:
    temperature: float
    top_p: float
    generator: torch.Generator
    top_logprobs: int = 0  # how many alternatives to report (0: none)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0


@dataclass
class SampledToken:
    token_id: int
    logprob: float
    top: list[tuple[int, float]] | None  # (token id, logprob) alternatives, best first, if asked for


def distributions(logits: torch.Tensor, rows: list[RowSampling]) -> tuple[torch.Tensor, torch.Tensor]:
    """(`logits` as float on CPU, the log-probs each row draws from: log_softmax(logits / temperature) within
    its top-p nucleus, renormalized; greedy rows: the plain log_softmax). `logits`: [rows, vocab]."""
    # Sampling runs on CPU (per-request CPU generators; [batch, vocab] is small next to a forward pass).
    logits = logits.detach().float().cpu()
    temps = torch.tensor([r.temperature for r in rows], dtype=logits.dtype)
    scale = torch.where(temps <= 0, torch.ones_like(temps), temps)
    logp = torch.log_softmax(logits / scale[:, None], dim=-1)
    nucleus_rows = [i for i, r in enumerate(rows) if 0 < r.top_p < 1 and r.temperature > 0]
    if nucleus_rows:
        idx = torch.tensor(nucleus_rows)
        top_p = torch.tensor([rows[i].top_p for i in nucleus_rows], dtype=logits.dtype)
        logp[idx] = _restrict_to_nucleus(logp[idx], top_p)
    return logits, logp


def sample(logits: torch.Tensor, rows: list[RowSampling]) -> list[SampledToken]:
    """`logits`: [batch, vocab] for the next position of each row."""
    logits, logp = distributions(logits, rows)
    greedy = torch.tensor([r.greedy for r in rows])
    chosen = torch.empty(len(rows), dtype=torch.long)
    sampled_rows = [i for i in range(len(rows)) if not bool(greedy[i])]
    if len(sampled_rows) < len(rows):
        greedy_idx = torch.nonzero(greedy).flatten()
        chosen[greedy_idx] = logits[greedy_idx].argmax(dim=-1)
    if sampled_rows:
        idx = torch.tensor(sampled_rows)
        # u in (0, 1]: one draw per row from that row's own generator (inverse-CDF sampling).
        u = torch.stack([_uniform(rows[i].generator) for i in sampled_rows])
        cdf = torch.cumsum(logp[idx].exp(), dim=-1)
        picks = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(-1).to(cdf.dtype)).squeeze(-1)
        chosen[idx] = picks.clamp_(max=logits.shape[-1] - 1)

    chosen_lp = logp.gather(-1, chosen[:, None]).squeeze(-1)
    want_top = max((r.top_logprobs for r in rows), default=0)
    best = logp.topk(want_top, dim=-1) if want_top > 0 else None

    ids, lps = chosen.tolist(), chosen_lp.tolist()
    out: list[SampledToken] = []
    for i, r in enumerate(rows):
        top = None
        if r.top_logprobs > 0 and best is not None:
            top_ids, top_vals = best.indices[i, : r.top_logprobs], best.values[i, : r.top_logprobs]
            top = list(zip(top_ids.tolist(), top_vals.tolist(), strict=True))
        out.append(SampledToken(ids[i], lps[i], top))
    return out


def verify(
    logits: torch.Tensor, rows: list[RowSampling], drafts: list[list[int]]
) -> list[list[SampledToken]]:
    """Speculative decoding's acceptance, exact: row r fed its drafts after its pending token, and its
    `len(drafts[r]) + 1` logits rows (consecutive in `logits`, row after row) are the model's next-token
    logits after the pending token and after each draft. Walking them in order, each position's token is
    drawn from the model's distribution p there, given that every earlier draft was kept: greedy rows take
    the argmax; sampled rows keep the draft d with probability p(d) (the rejection rule for a proposal that
    is certain, q(d) = 1) and otherwise draw from p without d, renormalized — so the emitted token is
    distributed exactly as p. The walk stops at the first token that differs from its draft (or after the
    last draft: a bonus token). Each token's logprob is log p(token), as `sample` reports it. Returns the
    emitted tokens of each row (at least one)."""
    per_position = [row for row, draft in zip(rows, drafts, strict=True) for _ in range(len(draft) + 1)]
    logits, logp = distributions(logits, per_position)
    argmax = logits.argmax(dim=-1).tolist()
    out: list[list[SampledToken]] = []
    position = 0
    for row, draft in zip(rows, drafts, strict=True):
        tokens: list[SampledToken] = []
        for i in range(len(draft) + 1):
            here = logp[position + i]
            proposal = draft[i] if i < len(draft) else None
            token = argmax[position + i] if row.greedy else _draw(here, row.generator, proposal)
            top = None
            if row.top_logprobs > 0:
                best = here.topk(row.top_logprobs)
                top = list(zip(best.indices.tolist(), best.values.tolist(), strict=True))
            tokens.append(SampledToken(token, float(here[token]), top))
            if token != proposal:
                break
        out.append(tokens)
        position += len(draft) + 1
    return out


def _uniform(generator: torch.Generator) -> torch.Tensor:
    """u in (0, 1] from the row's own generator."""
    return 1.0 - torch.rand((), generator=generator)


def _draw(logp: torch.Tensor, generator: torch.Generator, proposal: int | None) -> int:
    """One token from exp(`logp`) [vocab]; with a `proposal`, the rejection rule: keep it with probability
    p(proposal), else draw from p without it."""
    if proposal is not None:
        if bool(_uniform(generator) <= logp[proposal].exp()):
            return proposal
        logp = logp.clone()
        logp[proposal] = float("-inf")
    cdf = torch.cumsum(logp.exp(), dim=-1)
    pick = int(torch.searchsorted(cdf, (_uniform(generator) * cdf[-1]).reshape(1).to(cdf.dtype)))
    return min(pick, logp.shape[-1] - 1)


_NUCLEUS_CANDIDATES = 1024


def _restrict_to_nucleus(logp: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Keeps the smallest set of most likely tokens whose mass reaches top_p; renormalizes over it.

    A full vocabulary sort costs ~25 ms per row on one CPU core; the nucleus almost always lies within the
    top 1024 tokens, so those are taken first (the same nucleus) and only when some row's nucleus is larger
    does the batch fall back to the full sort."""
    k = min(_NUCLEUS_CANDIDATES, logp.shape[-1])
    if k < logp.shape[-1]:
        top_lp, top_idx = logp.topk(k, dim=-1)  # sorted, descending
        if bool((top_lp.exp().sum(dim=-1) >= top_p).all()):
            kept = _nucleus_mask(top_lp, top_p)
            kept_lp = top_lp.masked_fill(~kept, float("-inf"))
            restricted = torch.full_like(logp, float("-inf")).scatter_(-1, top_idx, kept_lp)
            return restricted - torch.logsumexp(restricted, dim=-1, keepdim=True)
    sorted_lp, order = logp.sort(dim=-1, descending=True)
    drop_sorted = ~_nucleus_mask(sorted_lp, top_p)
    drop = torch.zeros_like(drop_sorted).scatter_(-1, order, drop_sorted)
    restricted = logp.masked_fill(drop, float("-inf"))
    return restricted - torch.logsumexp(restricted, dim=-1, keepdim=True)


def _nucleus_mask(sorted_lp: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Over descending log-probs: keep a token while the mass before it is below top_p (the first always)."""
    probs = sorted_lp.exp()
    return (torch.cumsum(probs, dim=-1) - probs) < top_p[:, None]
