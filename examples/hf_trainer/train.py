"""Train a tiny Llama on a local text file with the Hugging Face Trainer: no download at all.

The model is built from config.json (random init), the tokenizer is character level, made from
the text itself with the tokenizers library, and the data is input.txt cut into blocks. Run it
as is (`python train.py`), or let launch size it first:

    launch plan train.py --json     # traced from the model, optimizer and batch it builds
"""

import argparse
from pathlib import Path

import torch
from tokenizers import Tokenizer, models
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    DataCollatorForLanguageModeling,
    PreTrainedTokenizerFast,
    Trainer,
    TrainingArguments,
)

HERE = Path(__file__).resolve().parent


def char_tokenizer(text: str) -> PreTrainedTokenizerFast:
    """One token per character of the text (BPE without merges splits into characters)."""
    specials = ["<pad>", "<s>", "</s>", "<unk>"]
    vocab = {tok: i for i, tok in enumerate(specials + sorted(set(text)))}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<s>",
                                   eos_token="</s>", unk_token="<unk>")


class Blocks(torch.utils.data.Dataset):
    """The token stream cut into overlapping blocks of ``block_size`` tokens."""

    def __init__(self, ids: list[int], block_size: int) -> None:
        self.ids, self.block_size = ids, block_size

    def __len__(self) -> int:
        return max(0, len(self.ids) - self.block_size) // (self.block_size // 2)

    def __getitem__(self, i: int) -> dict[str, list[int]]:
        start = i * (self.block_size // 2)
        return {"input_ids": self.ids[start:start + self.block_size]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--max-steps", type=int, default=20)
    parser.add_argument("--output-dir", default=str(HERE / "out"))
    args = parser.parse_args()

    text = (HERE / "input.txt").read_text(encoding="utf-8")
    tokenizer = char_tokenizer(text)
    config = AutoConfig.from_pretrained(HERE / "config.json")
    config.vocab_size = max(config.vocab_size, len(tokenizer))
    model = AutoModelForCausalLM.from_config(config)

    dataset = Blocks(tokenizer(text)["input_ids"], args.block_size)
    training_args = TrainingArguments(
        output_dir=args.output_dir,
        per_device_train_batch_size=args.batch_size,
        gradient_accumulation_steps=2,
        learning_rate=1e-3,
        max_steps=args.max_steps,
        logging_steps=5,
        save_strategy="no",
        report_to="none",
    )
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=dataset,
        data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
    )
    trainer.train()


if __name__ == "__main__":
    main()
