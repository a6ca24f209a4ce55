"""A multi-turn task with two tools: the gate, boarding time or terminal of a flight to a
made-up city, found with `find_flight` (the city -> a flight code) then `flight_status`."""
