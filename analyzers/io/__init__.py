"""Input: DataLoader waits and their make-up, host time no operator covers, host-to-device
copies."""
