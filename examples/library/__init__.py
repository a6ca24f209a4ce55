"""A multi-turn task with two tools: which shelf holds a made-up book, found with
`find_book` (its title -> a book code) then `locate` (the code -> where it stands)."""
