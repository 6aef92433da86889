// Planted: a second header named Rendezvous.h.
