"""Data: embedded tasks generated from the seed, and the LightningDataModule that batches them."""
