"""Calibration text the model writes itself, for GPTQ on more tokens than the bundled text holds.

GPTQ's Hessian of a linear with K inputs is estimated from the calibration tokens: the bundled text
(assets/calibration.txt, ~2,900 tokens) is fewer tokens than the 0.5B's down_proj has inputs (4,864), so
the error compensation fits that text and the result swings with float summation order (the same recipe
measured 8.15 to 8.50 perplexity across runs: docs/results/quant_robustness_0.5b.json). The model's own
sampled answers to a spread of zh / en / code requests are text of its own distribution, in any amount, with
no download (data-free calibration in the manner of LLM-QAT's self-generated data). Measured on the real
0.5B it did not help: the extended bundled set alone gave w4 8.122, with 12,288 of these tokens added 8.423
(docs/results/quant_calibration_size_0.5b.json), so Recipe.self_tokens is 0 in the default recipe.

    ids = generated_segments(spec, tokens=24576)   # [[prompt + answer ids], ...], cached on disk

Sampling is seeded per sequence (temperature 0.8, top-p 0.95): the same model and settings give the same
text; the result is cached under the model cache (calib/<model file>-<size>-<tokens>.json).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

REQUESTS = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how a hash map works and when its lookups become slow.",
    "用三段话介绍长江流域的气候、农业和城市。",
    "Write a Python function that parses an ISO 8601 date string without external libraries, with tests.",
    "写一封正式的邮件，请求把项目截止日期推迟一周，并说明原因。",
    "Summarize the causes and consequences of the industrial revolution in Britain.",
    "Write a bash script that backs up a directory into a dated tar.gz and keeps the last seven copies.",
    "解释一下 TCP 三次握手的过程，以及为什么需要三次。",
    "Describe a recipe for a vegetable curry, step by step, with quantities.",
    "Write a JavaScript class for a simple event emitter with on, off and emit, and show how to use it.",
    "给一位刚入职的程序员写十条代码评审的建议。",
    "What are the trade-offs between SQL and NoSQL databases? Give concrete examples.",
    "Write a C function that reverses a singly linked list, and explain its complexity.",
    "以“秋天的早晨”为题写一篇三百字左右的短文。",
    "Explain gradient descent to a high-school student, with a small numeric example.",
    "Translate into Chinese and explain the grammar: 'The meeting has been moved to Thursday afternoon.'",
    "List the steps to debug a memory leak in a long-running server process.",
    "写一个 SQL 查询，统计每个部门工资最高的三名员工，并解释窗口函数。",
    "Write a dialogue between a customer and a support agent about a delayed parcel.",
    "Explain what a CUDA kernel launch is and why small kernels are slow.",
    "用 Python 写一个命令行待办事项程序，支持添加、完成和列出任务。",
    "Describe the water cycle and how climate change affects it.",
    "Write a Rust function that counts word frequencies in a text file and prints the top ten.",
    "请把下面的要点扩写成一段会议纪要：预算超支、下周上线、需要增加测试人员。",
    "Give a product description for a lightweight hiking backpack, in a friendly tone.",
    "Explain the difference between processes and threads, with an example in Go.",
    "介绍一下中国古代四大发明及其对世界的影响。",
    "Write unit tests in pytest for a function that validates e-mail addresses.",
    "Explain how public-key cryptography lets two strangers agree on a secret.",
    "写一段 TypeScript 代码，实现带重试和超时的 fetch 封装。",
    "Plan a three-day trip to Kyoto for someone who likes temples and food.",
    "Explain the CAP theorem and how real systems choose between consistency and availability.",
]
TEMPERATURE, TOP_P = 0.8, 0.95


def cache_path(spec, tokens: int, seq_len: int) -> Path:
    from engine.paths import models_dir

    src = Path(spec.source)
    size = src.stat().st_size if src.is_file() else sum(p.stat().st_size for p in src.glob("*") if p.is_file())
    return models_dir() / "calib" / f"{src.name}-{size}-{tokens}-{seq_len}.json"


def generated_segments(spec, tokens: int = 24576, seq_len: int = 384, batch: int = 16, seed: int = 0,
                       device: str = "cpu") -> list[list[int]]:
    """Sequences of <= seq_len ids (a chat-rendered request + the model's sampled answer) totalling >= tokens."""
    path = cache_path(spec, tokens, seq_len)
    if path.is_file():
        return json.loads(path.read_text())
    from engine.config import EngineConfig
    from engine.runtime.llm import LLM
    from engine.runtime.sampling import SamplingParams

    llm = LLM(EngineConfig(model=spec.source, device=device, max_context=seq_len + 8, max_batch=batch), spec=spec)
    prompts = [llm.encode_chat([{"role": "user", "content": r}]) for r in REQUESTS]
    out, total, i, t0 = [], 0, 0, time.perf_counter()
    while total < tokens:
        seqs = []
        for _ in range(batch):
            p = prompts[i % len(prompts)]
            params = SamplingParams(max_tokens=seq_len - len(p), temperature=TEMPERATURE, top_p=TOP_P,
                                    seed=seed * 100003 + i, ignore_eos=False)
            seqs.append((p, llm.new_sequence(p, params)))
            i += 1
        for p, s in zip([p for p, _ in seqs], llm.scheduler.run([s for _, s in seqs])):
            ids = list(p) + list(s.output_ids)
            out.append(ids)
            total += len(ids)
        print(f"  self-calibration text: {total}/{tokens} tokens ({time.perf_counter() - t0:.0f} s)",
              file=sys.stderr, flush=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out))
    del llm
    return out
