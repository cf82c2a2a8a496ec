from amqtransport.cli.main import main

main()
