"""Quantization schemes, the packed storage layout, and the methods (one module each).

Method modules register their stage on import; compress/recipe.py imports them.
"""
