"""The model side, in PyTorch: tokenizers (SentencePiece, llama2.c/llama3.c tokenizer.bin, Hugging Face tokenizer.json),
checkpoints (llama2.c files and Hugging Face Llama/Mistral/Qwen2 directories), the batched Transformer, sampling.
"""
from .checkpoint import CheckpointError, ModelConfig, check_vocab, read_checkpoint, write_checkpoint
from .llama import ContextOverflowError, Transformer, load_checkpoint
from .tokenizer import BaseTokenizer, Tokenizer, TokenizerError, load_tokenizer

__all__ = ["BaseTokenizer", "CheckpointError", "ContextOverflowError", "ModelConfig", "Tokenizer", "TokenizerError",
           "Transformer", "check_vocab", "load_checkpoint", "load_tokenizer", "read_checkpoint", "write_checkpoint"]
