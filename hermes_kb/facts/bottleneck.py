"""The facts rules derive: the first level of the paper's hierarchy (which component holds the step back)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import Fact, ratio, us


class Bottleneck(Fact):
    """Derived by a rule from measured facts: a component that takes a share of the step."""

    kind: Literal["bottleneck"] = "bottleneck"
    category: Literal["parallel", "io", "cpu", "computation", "communication"]
    component: str = Field(description="what holds the step back, e.g. data_loader, host_launch, exposed_comm")
    share_ratio: float = ratio("share of the step time this component takes")
    time_us: float | None = us("time per step at stake", default=None)
    rule_id: str = Field(description="the rule that derived it")
