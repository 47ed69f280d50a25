"""Views for people: plots, the terminal tables, the review cards and the report's detail tables."""
