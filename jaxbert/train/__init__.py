"""Masked-language-model fine-tuning: data, masking, optimizer and train state, the pure step, the loop."""
