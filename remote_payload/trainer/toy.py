"""A small structured chat language, its word-level tokenizer and a target trained on it.

Why it exists: the end-to-end proof (``e2e``) must run without downloads, yet needs a
target that is *confident* (a random target's greedy output is noise no drafter can
predict). The language: "count from 7 by 3" is answered "7 10 13 ..." (modulo ``modulus``,
``length`` numbers, then the end-of-turn token), so a few hundred steps make a tiny Qwen3
sure of every answer token while the answer still depends on the prompt.
"""

from __future__ import annotations

import random
import typing as t
from dataclasses import dataclass

import torch

CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} "
    "{% if m['role'] == 'assistant' %}<eot> {% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<assistant> {% endif %}")
SPECIALS = ["<pad>", "<unk>", "<mask>", "<eot>", "<system>", "<user>", "<assistant>"]
WORDS = ["count", "from", "by"]


@dataclass(frozen=True)
class Language:
    modulus: int = 32  # numbers 0 .. modulus-1 are words of the vocabulary
    max_stride: int = 3  # strides 1 .. max_stride
    length: int = 16  # numbers per answer

    def conversation(self, rng: random.Random) -> list[dict[str, str]]:
        start, stride = rng.randrange(self.modulus), rng.randint(1, self.max_stride)
        answer = " ".join(str((start + stride * i) % self.modulus) for i in range(self.length))
        return [{"role": "user", "content": f"count from {start} by {stride}"},
                {"role": "assistant", "content": answer}]

    def vocab(self) -> list[str]:
        return SPECIALS + WORDS + [str(i) for i in range(self.modulus)]


def make_tokenizer(lang: Language, out_dir: str) -> t.Any:
    """A word-level fast tokenizer with a chat template and a MASK token, saved to
    ``out_dir`` (loadable with ``AutoTokenizer.from_pretrained(out_dir)``)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(lang.vocab())}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", unk_token="<unk>",  # type: ignore[no-untyped-call,unused-ignore]  # transformers' stubs vary by version
                                  mask_token="<mask>", eos_token="<eot>")
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(out_dir)
    return tok


def vocab_size_for(tok: t.Any) -> int:
    return ((len(tok) + 15) // 16) * 16  # padded like real checkpoints (spare rows)


def train_target(tok: t.Any, lang: Language, out_dir: str, *, hidden: int = 64, layers: int = 4,
                 heads: int = 4, kv_heads: int = 2, head_dim: int = 16, steps: int = 300,
                 batch: int = 32, lr: float = 3e-3, device: str = "cpu", seed: int = 0,
                 log: t.Callable[[str], None] = print) -> dict[str, float]:
    """Train a Qwen3 target on ``lang`` (loss on answers) and save it to ``out_dir``.
    Returns the final loss and the greedy token accuracy on answer tokens."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from .chat_data import render_messages

    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=vocab_size_for(tok), hidden_size=hidden,
                      intermediate_size=hidden * 3, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
                      max_position_embeddings=4096, tie_word_embeddings=False,
                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                      bos_token_id=None)
    cfg._attn_implementation = "sdpa"
    model = Qwen3ForCausalLM(cfg).to(device)  # type: ignore[arg-type,unused-ignore]  # transformers' stubs vary by version
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, betas=(0.9, 0.95))
    rng = random.Random(seed)
    loss_v, acc = float("nan"), 0.0
    for step in range(steps):
        recs = [render_messages(tok, lang.conversation(rng)) for _ in range(batch)]
        n = max(len(ids) for ids, _ in recs)
        ids = torch.full((batch, n), tok.pad_token_id, dtype=torch.long)
        lab = torch.full((batch, n), -100, dtype=torch.long)
        for r, (x, m) in enumerate(recs):
            ids[r, :len(x)] = torch.tensor(x)
            lab[r, :len(x)] = torch.where(torch.tensor(m, dtype=torch.bool), torch.tensor(x), -100)
        ids, lab = ids.to(device), lab.to(device)
        lr_now = lr * min(1.0, (step + 1) / 20) * (0.1 + 0.9 * (1 - step / steps))
        for g in opt.param_groups:
            g["lr"] = lr_now
        out = model(input_ids=ids, labels=lab)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 50 == 0 or step == steps - 1:
            with torch.no_grad():
                pred = out.logits[:, :-1].argmax(-1)
                keep = lab[:, 1:] != -100
                acc = float((pred == lab[:, 1:])[keep].float().mean())
            loss_v = float(out.loss.detach())
            log(f"target step {step + 1}/{steps} loss {loss_v:.4f} answer-token acc {acc:.3f}")
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    from .target import save_target

    save_target(model, out_dir)
    return {"loss": loss_v, "acc": acc}
