"""Integrations of flash_attention with other libraries, each in its own module, imported on demand
(``import flash_attention`` imports none of them, nor the libraries they integrate with):

- ``flash_attention.integrations.transformers``: an attention implementation for Hugging Face
  transformers models (``register()``, then ``attn_implementation=`` the name it returns).
"""
