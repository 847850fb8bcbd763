"""learntok: byte-level language models that learn their own tokenization end to end.

Implements "You Can Learn Tokenization End-to-End with Reinforcement Learning" (Dauncey & Wattenhofer,
ICML 2026): an autoregressive U-Net over UTF-8 bytes whose token boundaries are sampled by a small
policy trained with a score-function estimator.
"""

__version__ = "0.1.0"
