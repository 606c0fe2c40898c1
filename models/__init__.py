"""The llama2.c model family in PyTorch: checkpoints, tokenizers, the batched Transformer, sampling."""
from .checkpoint import CheckpointError, ModelConfig, check_vocab, read_checkpoint, write_checkpoint
from .llama import ContextOverflowError, Transformer, load_checkpoint
from .tokenizer import BaseTokenizer, Tokenizer, TokenizerError, load_tokenizer

__all__ = ["BaseTokenizer", "CheckpointError", "ContextOverflowError", "ModelConfig", "Tokenizer", "TokenizerError",
           "Transformer", "check_vocab", "load_checkpoint", "load_tokenizer", "read_checkpoint", "write_checkpoint"]
