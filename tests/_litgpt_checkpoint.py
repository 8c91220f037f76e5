"""Make a tiny LitGPT checkpoint and instruction data in ROOT (``python _litgpt_checkpoint.py ROOT``).

Run by tests/test_programs.py with the interpreter of LitGPT's own environment (``make litgpt-env``):
a model built from a config with random weights, a word-level tokenizer made from a word list and
instruction records made from the same words. Nothing is downloaded.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from litgpt import GPT, Config
from litgpt.utils import save_config
from tokenizers import Tokenizer, models, pre_tokenizers

WORDS = "the a cat dog bird fox sat ran flew hid on under near mat log tree red blue green".split()


def make(root: Path) -> None:
    """``root/tiny-llama`` (config, weights, tokenizer) and ``root/data.json``."""
    checkpoint = root / "tiny-llama"
    checkpoint.mkdir()
    records = [{"instruction": f"where is the {animal}", "input": "", "output": f"the {animal} {verb} on the mat"}
               for animal in WORDS[2:6] for verb in WORDS[6:10]]
    (root / "data.json").write_text(json.dumps(records))
    # the words of the data; the prompt template's other words become <unk>
    vocab = {token: i for i, token in enumerate(["<unk>", "<s>", "</s>", *WORDS, "where", "is"])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(checkpoint / "tokenizer.json"))
    (checkpoint / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "add_bos_token": False}))
    config = Config(name="tiny-llama", block_size=128, vocab_size=len(vocab), padded_vocab_size=64, n_layer=2,
                    n_head=2, n_embd=32, intermediate_size=64, rotary_percentage=1.0, parallel_residual=False,
                    bias=False, norm_class_name="RMSNorm", mlp_class_name="LLaMAMLP")
    save_config(config, checkpoint)
    torch.manual_seed(0)
    torch.save(GPT(config).state_dict(), checkpoint / "lit_model.pth")


if __name__ == "__main__":
    make(Path(sys.argv[1]))
