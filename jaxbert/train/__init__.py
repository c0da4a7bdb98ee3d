"""Fine-tuning: masked-language modelling and the tasks of `train/task_table.py` (data readers, labels,
masking, optimizer and train state, one pure train step, the loop with checkpoint/resume)."""
