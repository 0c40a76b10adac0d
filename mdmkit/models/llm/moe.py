"""A mixture-of-experts MLP: a router picks `top_k` of `experts` SwiGLU experts per token, plus shared experts.

The two routers of the diffusion MoE LLMs are options of one module (`MoEConfig`):

- softmax (LLaDA-MoE): probabilities softmax(router logits) in float32; an optional per-expert bias is added to them
  and, with `bias_in_weights`, the biased values are both what is ranked and what weights the experts;
- sigmoid (LLaDA2.0): scores sigmoid(router logits), computed in float32 from float32 logits; the bias only ranks,
  the weights are the unbiased scores; with `groups`, experts are ranked inside the `top_groups` groups whose two
  best scores sum highest (group-limited routing); the weights are then normalised to sum 1 and scaled.

The experts' weights are stacked, one parameter per projection ([experts, out, in]), and run on tokens grouped by
expert (`MoE.run_experts`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from mdmkit.core.config import Validated, require

# torch's grouped product (CPU, and CUDA in bfloat16 from SM 80; newer releases): a slice of rows per expert
_grouped_mm = getattr(F, "grouped_mm", None)


@dataclass
class MoEConfig(Validated):
    """Shape and routing rule of the MoE layers (`layers`: their indices; the others are dense)."""

    experts: int
    top_k: int
    expert_hidden: int  # intermediate width of one routed expert
    layers: tuple[int, ...]
    shared_hidden: int = 0  # intermediate width of the shared expert(s), added unweighted (0: none)
    router: Literal["softmax", "sigmoid"] = "softmax"
    router_fp32: bool = False  # router logits from float32 input and weights (else in the weights' dtype)
    expert_bias: bool = False  # a per-expert bias added to the scores before ranking
    bias_in_weights: bool = False  # the biased scores weight the experts (else the bias only ranks)
    groups: int = 1  # group-limited routing: experts ranked inside the best `top_groups` of `groups` groups
    top_groups: int = 1
    normalize: bool = False  # weights divided by their sum over the chosen experts
    scale: float = 1.0  # weights multiplied by this
    # experts' outputs weighted and summed in float32 (else in the activations' dtype, in the experts' id order)
    combine_fp32: bool = False

    def validate(self) -> None:
        require(self.experts >= 1 and self.expert_hidden >= 1, "experts and expert_hidden must be >= 1")
        require(1 <= self.top_k <= self.experts, f"top_k={self.top_k} must lie in [1, experts={self.experts}]")
        require(self.shared_hidden >= 0, f"shared_hidden={self.shared_hidden} must be >= 0")
        require(self.groups >= 1 and self.experts % self.groups == 0,
                f"groups={self.groups} must divide experts={self.experts}")
        require(1 <= self.top_groups <= self.groups, f"top_groups={self.top_groups} must lie in [1, {self.groups}]")
        require(self.groups == 1 or self.experts // self.groups >= 2,
                "group-limited routing scores a group by its two best experts: at least 2 experts per group")
        require(self.groups == 1 or self.top_groups * self.experts // self.groups >= self.top_k,
                f"top_groups={self.top_groups} groups hold fewer than top_k={self.top_k} experts")
        require(all(layer >= 0 for layer in self.layers), "layers must be layer indices >= 0")

    def expert_parameters(self, d_model: int) -> int:
        """Parameters of one routed expert (gate, up and down projections)."""
        return 3 * d_model * self.expert_hidden


class GatedMLP(nn.Module):
    """down(silu(gate(x)) * up(x)), no biases: a dense layer's MLP and the shared expert."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.gate = nn.Linear(width, hidden, bias=False)
        self.up = nn.Linear(width, hidden, bias=False)
        self.down = nn.Linear(hidden, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class MoE(nn.Module):
    """x [..., d_model] -> sum over the chosen experts of weight * expert(x), plus the shared expert's output."""

    expert_bias: torch.Tensor | None  # a buffer [experts] where the config has one

    def __init__(self, d_model: int, config: MoEConfig) -> None:
        super().__init__()
        self.config = config
        experts, hidden = config.experts, config.expert_hidden
        self.router = nn.Linear(d_model, experts, bias=False)
        self.gate = nn.Parameter(torch.empty(experts, hidden, d_model))
        self.up = nn.Parameter(torch.empty(experts, hidden, d_model))
        self.down = nn.Parameter(torch.empty(experts, d_model, hidden))
        self.register_buffer("expert_bias", torch.zeros(experts) if config.expert_bias else None)
        self.shared = GatedMLP(d_model, config.shared_hidden) if config.shared_hidden else None

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Chosen experts [N, top_k] (best first), their weights [N, top_k] and the router logits [N, experts] of
        the tokens x [N, d_model]."""
        config = self.config
        logits = F.linear(x.float(), self.router.weight.float()) if config.router_fp32 else self.router(x)
        if config.router == "softmax":
            scores = F.softmax(logits, dim=-1, dtype=torch.float32)
        else:
            scores = torch.sigmoid(logits.float())
        ranked = scores if self.expert_bias is None else scores + self.expert_bias
        if config.groups > 1:
            ranked = self._within_best_groups(ranked)
        best, chosen = torch.topk(ranked, config.top_k, dim=-1)
        weights = best if config.bias_in_weights else scores.gather(-1, chosen)
        if config.normalize:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        return chosen, weights * config.scale if config.scale != 1.0 else weights, logits

    def _within_best_groups(self, ranked: torch.Tensor) -> torch.Tensor:
        """`ranked` with the experts outside each token's `top_groups` best groups at -inf."""
        tokens, groups = ranked.shape[0], self.config.groups
        grouped = ranked.view(tokens, groups, -1)
        group_score = grouped.topk(2, dim=-1).values.sum(-1)
        best = torch.topk(group_score, self.config.top_groups, dim=-1, sorted=False).indices
        keep = torch.zeros_like(group_score, dtype=torch.bool).scatter_(1, best, True)
        return grouped.masked_fill(~keep[:, :, None], float("-inf")).view(tokens, -1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        chosen, weights, _ = self.route(flat)
        outputs = self.run_experts(flat, chosen)  # [N, top_k, d_model]
        if self.config.combine_fp32:
            routed = (outputs.float() * weights.float()[..., None]).sum(1).to(x.dtype)
        else:  # in the activations' dtype, added expert by expert in id order (one rounding per addition)
            weighted = outputs * weights.to(x.dtype)[..., None]
            by_id = chosen.argsort(dim=1)[..., None].expand_as(weighted)
            weighted = weighted.gather(1, by_id)
            routed = weighted[:, 0]
            for slot in range(1, weighted.shape[1]):  # top_k additions, whatever the number of tokens
                routed = routed + weighted[:, slot]
        if self.shared is not None:
            routed = routed + self.shared(flat)
        return routed.view(shape)

    def _groupable(self, x: torch.Tensor) -> bool:
        """Whether torch's grouped product takes these operands: on the CPU, or CUDA in bfloat16, with rows whose
        bytes are a multiple of 16."""
        rows = (x.shape[-1] * x.element_size(), self.config.expert_hidden * x.element_size())
        supported = x.device.type == "cpu" or x.dtype == torch.bfloat16
        return _grouped_mm is not None and supported and all(size % 16 == 0 for size in rows)

    def run_experts(self, x: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
        """Each token's chosen experts applied to it [N, top_k, d_model]: the (token, expert) pairs sorted by
        expert, so each expert's tokens are one contiguous slice, then three grouped products (or, where torch has
        no grouped product for these operands, one product per expert on its slice, never a loop over tokens)."""
        pairs = chosen.reshape(-1)
        order = pairs.argsort(stable=True)
        counts = torch.bincount(pairs, minlength=self.config.experts)
        inputs = x[order // chosen.shape[1]]
        if self._groupable(x) and _grouped_mm is not None:
            ends = counts.cumsum(0).to(torch.int32)  # stays on the device: no host sync
            gate = _grouped_mm(inputs, self.gate.transpose(1, 2), offs=ends)
            hidden = F.silu(gate) * _grouped_mm(inputs, self.up.transpose(1, 2), offs=ends)
            outputs = _grouped_mm(hidden, self.down.transpose(1, 2), offs=ends)
        else:
            outputs = torch.empty_like(inputs)
            start = 0
            for expert, count in enumerate(counts.tolist()):  # one host sync per layer
                if count:
                    part = inputs[start: start + count]
                    hidden = F.silu(F.linear(part, self.gate[expert])) * F.linear(part, self.up[expert])
                    outputs[start: start + count] = F.linear(hidden, self.down[expert])
                    start += count
        placed = torch.empty_like(outputs)
        placed[order] = outputs
        return placed.view(*chosen.shape, x.shape[-1])
