//! The LLM gateway: an OpenAI-compatible metering proxy between agents and backbones.
