"""A model someone trained already: Hugging Face configs (hf) made into workloads, and
safetensors checkpoints (weights) read as sextant's canonical parameters, checked and
content-hashed."""
