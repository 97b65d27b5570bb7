"""The artifact: safetensors in the compressed-tensors format, config.json, manifest, model card."""
