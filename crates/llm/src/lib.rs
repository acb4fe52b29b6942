//! etch llm layer.
