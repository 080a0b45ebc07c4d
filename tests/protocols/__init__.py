"""Under the API: the engine layer, the object protocol, serializers, the argument check."""
