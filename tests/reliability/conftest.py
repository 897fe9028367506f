"""Reliability tests: checkpoint files, finding the resume point and the rollout-state format (fast, no Ray), and
acceptance runs on a real local Ray with the tiny preset (`integration`): a killed driver, a killed rollout
replica, a killed trainer, a truncated checkpoint, and a graceful stop — each resumed with an exact ledger."""

from __future__ import annotations

import torch

torch.set_num_threads(1)
