"""Running a trained model: bigbatch predict and bigbatch.load."""
