"""A small client for trainers: take the next exported batch, train on it, say so; announce the
policy version served (``PolicyClient``, around a weight sync).

```python
from claw_pipelines.trainer import BatchConsumer

consumer = BatchConsumer("grpo", consumer="verl-run-7")
while (batch := consumer.next(timeout_s=600)) is not None:
    tensors, non_tensors = batch.to_verl(pad_to_multiple=world_size)
    ...  # train
    consumer.ack(batch.batch_id, trainer_step=step)
```
"""

from claw_pipelines.trainer.batch import Batch
from claw_pipelines.trainer.consumer import BatchConsumer
from claw_pipelines.trainer.policy import PolicyClient

__all__ = ["Batch", "BatchConsumer", "PolicyClient"]
