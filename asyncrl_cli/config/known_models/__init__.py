"""config.json files of the models the shipped presets use, so `validate` can size them offline."""
