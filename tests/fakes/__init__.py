"""Wire-level fakes of cloud services, for tests that drive the real client libraries on
loopback. One module per service family, so several can live here side by side."""
