"""One DPO training step on a preference-token dataset, run inside a venv with trl and torch.

``python dpo_step.py <dataset.parquet> <claw_pipelines/trainer/dpo.py> <work dir>``: the
dataset is ``Batch.to_trl("preference_tokens")`` saved by the test
(``test_dpo_trainer.py``); the trainer module is loaded from its file, as the package's own
imports (polars, deltalake) are not in this venv. The model (Llama) and tokenizer (word level)
are built here, tiny and random: nothing is downloaded. Prints one JSON object: what stock
``DPOTrainer`` raised on the dataset, and the sequences and masks the collator fed to the
``TokenDPOTrainer`` step.
"""

from __future__ import annotations

import importlib.util
import json
import sys

import datasets
import torch
import transformers
import trl
from tokenizers import Tokenizer, models

VOCAB = 2048


def _tokenizer() -> transformers.PreTrainedTokenizerFast:
    vocab = {f"t{i}": i for i in range(VOCAB)}
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t0")),
        pad_token="t0",
        eos_token="t1",
        unk_token="t0",
    )


def _model() -> transformers.LlamaForCausalLM:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256,
        pad_token_id=0, eos_token_id=1, bos_token_id=1,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config)


def _load(path: str):
    spec = importlib.util.spec_from_file_location("claw_dpo", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(data: str, trainer_file: str, work: str) -> dict:
    dataset = datasets.Dataset.from_parquet(data)
    args = trl.DPOConfig(
        output_dir=work, per_device_train_batch_size=len(dataset), max_steps=1, report_to=[],
        save_strategy="no", use_cpu=True, logging_steps=1, dataset_num_proc=None,
    )  # fmt: skip
    try:
        trl.DPOTrainer(model=_model(), ref_model=_model(), args=args, train_dataset=dataset,
                       processing_class=_tokenizer())  # fmt: skip
        stock = None
    except Exception as error:  # what stock preparation does with token columns
        stock = f"{type(error).__name__}: {error}"

    trainer = _load(trainer_file).TokenDPOTrainer(
        model=_model(), ref_model=_model(), args=args, train_dataset=dataset,
        processing_class=_tokenizer(),
    )  # fmt: skip
    fed = []
    collate = trainer.data_collator

    def recording(examples):
        batch = collate(examples)
        fed.append(batch)
        return batch

    trainer.data_collator = recording
    result = trainer.train()
    batch = fed[0]
    sequences, completions = [], []
    for ids, attention, completion in zip(
        batch["input_ids"], batch["attention_mask"], batch["completion_mask"], strict=True
    ):
        sequences.append(ids[attention == 1].tolist())
        completions.append(ids[completion == 1].tolist())
    return {
        "trl": trl.__version__,
        "torch": torch.__version__,
        "stock_error": stock,
        "steps": result.global_step,
        "loss": result.training_loss,
        "sequences": sequences,
        "completions": completions,
    }


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:4])))
