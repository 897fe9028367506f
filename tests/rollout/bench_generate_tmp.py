import sys, time, torch
from transformers import LlamaConfig, LlamaForCausalLM
from engine.rollout.hf import HFRolloutBackend
from engine.rollout.base import SamplingParams
from engine.types import GenRequest
dev = "cuda"
cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                  num_key_value_heads=3, max_position_embeddings=2048, tie_word_embeddings=True)
torch.manual_seed(0)
base = LlamaForCausalLM(cfg).eval()
for dtype in (torch.bfloat16, torch.float32):
    m = base.to(dev, dtype)
    be = HFRolloutBackend(m, eos_token_id=2, pad_token_id=2, device=dev)
    for P, n, T in ((32, 8, 128), (8, 4, 64)):
        g = torch.Generator().manual_seed(1)
        prompts = [torch.randint(3, 49152, (100,), generator=g).tolist() for _ in range(P)]
        reqs = [GenRequest(f"{i}-{j}", p, max_new_tokens=T) for i, p in enumerate(prompts) for j in range(n)]
        be.generate(reqs[:4], SamplingParams(temperature=1.0, seed=0))
        torch.cuda.synchronize(); t = time.perf_counter()
        res = be.generate(reqs, SamplingParams(temperature=1.0, seed=0)); torch.cuda.synchronize()
        dt = time.perf_counter() - t; ntok = sum(r.new_tokens for r in res)
        ids = torch.tensor(prompts, device=dev)
        with torch.no_grad():
            m.generate(ids[:1], max_new_tokens=4, do_sample=True, pad_token_id=2)
            torch.cuda.synchronize(); t = time.perf_counter()
            o = m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=T, do_sample=True, top_k=0, top_p=1.0,
                           num_return_sequences=n, eos_token_id=2, pad_token_id=2)
            torch.cuda.synchronize()
        dh = time.perf_counter() - t; nh = o[:, 100:].numel()
        print(f"{dtype} P={P} n={n} T={T}: ours {ntok/dt:.0f} tok/s ({dt:.2f}s)  generate {nh/dh:.0f} tok/s ({dh:.2f}s)", flush=True)
