"""The backend plugins, the plugin system and the conformance kit."""
