"""LLM judge of captions (Table 3, "LLM" column): which of several models' captions is best.

The paper asks Qwen2.5-VL-72B, per image, to pick the best of four letter-labelled captions
(MDC-10/15/20 and ARC) and reports each model's selection rate. Here any OpenAI-compatible
chat-completions server can judge (e.g. vLLM serving Qwen2.5-VL); only the standard library
is used. Letter order is shuffled per image with a seeded RNG (against position bias) and
recorded; answers that name no single letter are counted as invalid, never guessed.
"""
from __future__ import annotations

import base64
import json
import logging
import mimetypes
import re
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Mapping, Sequence

import numpy as np

logger = logging.getLogger(__name__)

#: The paper's judge prompt (Sec. 4.2); the letter-labelled captions follow it, one per line.
JUDGE_PROMPT = "Which caption best depicts the image and is also coherent (no duplicate words or awkward phrasing)?"
#: Appended after the captions so that the answer can be parsed (not in the paper).
JUDGE_ANSWER_FORMAT = "Answer with the letter of the best caption."


def judge_prompt(captions: Sequence[str]) -> str:
    lines = [f"({chr(65 + k)}) {c}" for k, c in enumerate(captions)]
    return "\n".join([JUDGE_PROMPT, *lines, JUDGE_ANSWER_FORMAT])


def parse_choice(answer: str, n: int) -> str | None:
    """The letter (A, B, ...) of ``n`` captions that a judge's answer names, or None.

    Accepts a lone letter ("b", "(B)", "**B**"), a letter after answer/caption/option/choice
    ("Answer: C", "Caption B is best"), or one parenthesised or sentence-final capital letter.
    Several different letters, or none, give None: an invalid answer is never guessed.
    """
    upper = "".join(chr(65 + k) for k in range(n))
    lower = upper.lower()
    end = r"(?=[\s.)\]!,:]*$|[)\]]?\s+(?:is|was)\b)"  # a lower-case letter ends the answer or is "b is ..."
    text = re.sub(r"[*_`\"]", "", answer).strip()  # markdown emphasis and quotes
    lone = re.fullmatch(rf"[(\[]?\s*([{upper}{lower}])\s*[)\]]?[.:!]?", text)
    if lone:
        return lone.group(1).upper()
    keyword = rf"(?i:\b(?:answer|caption|option|choice)\b(?:\s+is)?)\s*:?\s*[(\[]?([{upper}]\b|[{lower}]{end})"
    free = rf"[(\[]([{upper}{lower}])[)\]]|\b([{upper}])\b(?=\s*(?:[.)!,:]|$))"
    for pattern in (keyword, free):
        found = {g.upper() for m in re.finditer(pattern, text) for g in m.groups() if g}
        if found:
            return found.pop() if len(found) == 1 else None
    return None


def _chat(url: str, model: str, image_path: str, prompt: str, timeout: float, api_key: str | None) -> str:
    """One OpenAI chat-completions request with the image as a base64 data URL; the answer text."""
    mime = mimetypes.guess_type(image_path)[0] or "image/jpeg"
    with open(image_path, "rb") as f:
        data_url = f"data:{mime};base64,{base64.b64encode(f.read()).decode()}"
    body = {"model": model, "temperature": 0, "max_tokens": 32, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": data_url}}, {"type": "text", "text": prompt}]}]}
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {api_key}"} if api_key else {})
    request = urllib.request.Request(url, json.dumps(body).encode(), headers, method="POST")
    with urllib.request.urlopen(request, timeout=timeout) as response:
        reply = json.loads(response.read())
    try:
        return reply["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError) as exn:
        raise ValueError(f"not a chat-completions reply: {str(reply)[:200]}") from exn


def llm_judge(items: Sequence[Mapping], captions_by_model: Mapping[str, Mapping], *, endpoint: str,
              model: str, seed: int = 0, workers: int = 4, timeout: float = 120.0,
              api_key: str | None = None) -> dict:
    """Reference-free comparison (Table 3, "LLM"): per image, the judge at ``endpoint`` (an
    OpenAI-compatible server, e.g. vLLM hosting Qwen2.5-VL; ``.../v1`` or the full
    ``.../chat/completions`` URL) sees the image and :func:`judge_prompt` of the models'
    captions in a seeded random letter order, and names the best.

    Returns ``{model, endpoint, models, images, valid, invalid, failed, counts, selection_rate,
    reason, answers}``: ``selection_rate[name]`` = counts / valid answers; unparseable answers
    are ``invalid`` and failed requests ``failed`` (neither is counted for any model);
    ``answers`` holds per image the letter order, the raw answer and the choice. Without an
    endpoint, or with fewer than two models, nothing is sent and ``reason`` says why
    (``selection_rate`` None).
    """
    names = list(captions_by_model)
    summary = {"model": model, "endpoint": endpoint, "models": names, "images": 0, "valid": 0, "invalid": 0,
               "failed": 0, "counts": {}, "selection_rate": None, "reason": None, "answers": []}
    if not endpoint:
        return summary | {"reason": "no judge endpoint configured (judge_endpoint is empty)"}
    if len(names) < 2:
        return summary | {"reason": f"the judge compares captions of several models; got {names}"}
    url = endpoint.rstrip("/")
    url = url if url.endswith("/chat/completions") else url + "/chat/completions"
    rng = np.random.default_rng(seed)
    jobs = []
    for it in items:
        if all(it["image_id"] in captions_by_model[n] for n in names):
            order = [names[k] for k in rng.permutation(len(names))]
            jobs.append((it, order, judge_prompt([captions_by_model[n][it["image_id"]] for n in order])))

    def ask(job):
        it, order, prompt = job
        record = {"image_id": it["image_id"], "order": {chr(65 + k): n for k, n in enumerate(order)},
                  "answer": None, "choice": None, "error": None}
        try:
            record["answer"] = _chat(url, model, it["image_path"], prompt, timeout, api_key)
        except Exception as exn:
            record["error"] = f"{type(exn).__name__}: {exn}"
            return record
        letter = parse_choice(record["answer"], len(order))
        record["choice"] = record["order"][letter] if letter else None
        return record

    with ThreadPoolExecutor(max(1, workers)) as pool:
        answers = list(pool.map(ask, jobs))
    counts = {n: sum(a["choice"] == n for a in answers) for n in names}
    failed = [a for a in answers if a["error"]]
    valid = sum(counts.values())
    summary |= {"images": len(answers), "valid": valid, "failed": len(failed), "counts": counts,
                "invalid": len(answers) - valid - len(failed), "answers": answers}
    if valid:
        summary["selection_rate"] = {n: c / valid for n, c in counts.items()}
    else:
        first_error = failed[0]["error"] if failed else "no parseable answer"
        summary["reason"] = f"no valid judge answer for {len(answers)} images (first error: {first_error})"
    if failed:
        logger.warning("LLM judge: %d of %d requests failed (first: %s)", len(failed), len(answers), failed[0]["error"])
    return summary
