"""The way to the monitor and back: the address and handshake, the hello, the sender thread,
its pace, and the commands applied at step boundaries."""
