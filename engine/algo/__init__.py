"""Pure torch algorithm layer: GRPO advantages, policy losses, KL, rollout correction (verl 0.9 semantics).

Modules: `advantages`, `policy_loss`, `seq_policy_loss` (GSPO, GMPO), `kl`, `stats`, `rollout_correction` (entry point) with `rc_config`,
`rc_weights`, `rc_rejection`, `rc_diagnostics`, and `loss` (the trainer-facing LossFn)."""
