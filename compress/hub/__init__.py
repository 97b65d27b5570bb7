"""Publishing: the model card made from the manifest, and `push` to the Hugging Face Hub."""
