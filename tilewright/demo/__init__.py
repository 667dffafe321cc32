"""The main job: real models through the backend, checked against eager (``tilewright demo``)."""
