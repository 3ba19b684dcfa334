"""Input: DataLoader waits and their make-up (``dataloader``), host time no operator covers
(``untraced``), host-to-device copies (``h2d``); ``io`` runs them as the io analyzer."""
