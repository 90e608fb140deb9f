"""Is the oracle right? The paper's validation (B.3) as tools: samples of finished tests, an LLM judge, an
annotation page for people, and the agreement between them and ReTrace."""
