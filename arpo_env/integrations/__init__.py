"""arpo's environments under other libraries' APIs: TRL's ``environment_factory`` and its datasets."""
